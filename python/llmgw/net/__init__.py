"""Connections and HTTP, shared by every server: the HTTP/1.1 client, the served connection
seen from the kernel, silent-connection sweeps, deadlines and granian serving; imports nothing
from admin/, agent/, cli/, control/, engines/, gateway/ or store/."""
