"""The control plane: catalog, inventory, placement and the reconciler; imports no gateway code."""
