"""fedrun: an HPC-native runtime for federated-learning research."""
