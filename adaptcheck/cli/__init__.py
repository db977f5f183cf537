"""Command-line interface: thin commands that parse, call one library function and render."""
