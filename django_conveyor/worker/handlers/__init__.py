"""Where handlers run: the slot threads, one attempt's pipeline, `task_finished`."""
