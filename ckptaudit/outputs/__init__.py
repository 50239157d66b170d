"""What an audit's result becomes: the closing summary (and each failed job's error line), report.html's
cells and headline, SARIF, JUnit XML and Prometheus metrics."""
