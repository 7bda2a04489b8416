"""C kernels for the hottest CPU loops, built on first use and loaded with ctypes (kernels.py)."""
