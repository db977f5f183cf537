"""ACME NPU: a made-up vendor that exists to prove a new vendor is one plugin package.

Nothing here describes real hardware: the device runs on torch's CPU device, the SMI tool is
the plugin's own script (``acme_smi.py``, which prints a fixed listing), and the peaks and
rules files carry invented figures marked ``verified: false``.
"""
