"""What gateways and the control plane exchange over `/internal/v1/`: the msgspec messages both
sides import; imports nothing from admin/, agent/, cli/, control/, engines/, gateway/ or store/."""
