"""The node agent: GPU inventory, the engine supervisor (launchers are in engines/) and the
stream to the control plane; it imports nothing from control/, gateway/ or store/."""
