"""The data plane: the RSGI app serving the OpenAI API; must not import the control plane."""
