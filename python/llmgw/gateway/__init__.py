"""The data plane: the RSGI app serving the OpenAI API; imports nothing from control/, admin/
or store/ (what it shares with them is in net/, protocol/, secrets/ and config)."""
