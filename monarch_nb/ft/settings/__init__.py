"""Plain data both sides read: what a run is (``RunConfig``, job files, model flavours, the
platform), what a fault is, the on-disk checkpoint format, the plain job's address. Nothing here
starts a process, holds a lock or imports Monarch: the controller and the workers import it alike."""
