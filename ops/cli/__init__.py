"""The `tidelog` command line."""
