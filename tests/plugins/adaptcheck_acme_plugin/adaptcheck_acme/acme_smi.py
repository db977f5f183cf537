"""The plugin's own stand-in for a vendor SMI tool: ``acme-smi --list`` prints a fixed listing
(a test puts an ``acme-smi`` wrapper of this module on PATH)."""

import sys

LISTING = "0 ACME NPU 0 driver 1.2.3\n"

if __name__ == "__main__":
    if sys.argv[1:] != ["--list"]:
        print("usage: acme-smi --list", file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(LISTING)
