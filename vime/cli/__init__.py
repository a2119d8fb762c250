"""The ``vime`` command line; each subcommand is a thin shell over a Python API."""
