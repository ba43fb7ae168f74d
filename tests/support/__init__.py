"""What the tests share that is not a test: processes started and stopped, stand-ins for the
control plane, builders of fleets and stores, fakes, and waits with a deadline."""
