"""Package placeholder; the issue that builds it fills it in."""
