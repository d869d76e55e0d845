"""Processes and communication: the World, the flat buffer layouts and the two collectives per round."""
