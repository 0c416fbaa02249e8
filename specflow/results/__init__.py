"""Where results go: the resumable ledger, MLflow tracking, the report and console output."""
