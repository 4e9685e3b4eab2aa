"""Wrappers of the external tools profattr runs (Nsight Systems), shared by the capture and trace stages."""
