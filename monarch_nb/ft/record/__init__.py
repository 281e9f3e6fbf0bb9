"""Pure folds of events, used by the controller and by anyone reading a run later: worker
telemetry into typed events (``ingest``), what a recovery is and its phases (``recovery``), and
a run's history from its event log (``history``). No threads, no processes, no I/O but reading."""
