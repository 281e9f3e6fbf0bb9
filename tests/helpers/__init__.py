"""What tests share but do not test: the leak check, a kernel client, process and notice checks,
and the bench scripts' runner. Imported as ``helpers.<module>`` (``tests/`` is on the path)."""
