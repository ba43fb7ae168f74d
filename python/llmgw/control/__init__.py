"""The control plane: its process and state, the catalog, inventory, placement and the
reconciler; imports nothing from gateway/."""
