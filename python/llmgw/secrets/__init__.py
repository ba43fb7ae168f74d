"""Secrets: keys derived from the cluster secret, API keys and their keyed hash, and the data
dir's owner-only secret files; imports nothing from admin/, agent/, cli/, control/, engines/,
gateway/ or store/."""
