"""Programs the reliability tests run as real child processes."""
