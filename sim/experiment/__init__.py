"""``splitspec sim run``: real cloud and edge processes through the emulated link, measured; reports and plots."""
