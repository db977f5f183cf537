"""Allow ``python -m adaptcheck``."""

from adaptcheck.cli.app import main

if __name__ == "__main__":
    main()
