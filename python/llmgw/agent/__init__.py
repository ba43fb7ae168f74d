"""The node agent: GPU inventory, engine launchers, the engine supervisor and the stream to the control plane; it imports nothing from control/, gateway/ or store/."""
