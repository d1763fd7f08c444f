"""Training: loops, schedules and run directories, built on the layers below."""
