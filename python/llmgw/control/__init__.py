"""The control plane process: its data dir, settings and the `ControlPlane` state the admin API serves; imports no gateway code."""
