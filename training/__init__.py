"""Training code for the bundled demo model pair (models/demo/); not part of the installed packages."""
