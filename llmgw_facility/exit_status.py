"""The exit statuses of `llmgw-facility` (0: done), one meaning each across its commands."""

#: Exit status for a facility file that cannot be used (argparse uses 2 for bad usage too).
EXIT_BAD_FILE = 2
#: The decider answered with an error (4xx, 5xx).
EXIT_REFUSED = 1
#: The decider could not be reached, did not answer in time, or is not the decider.
EXIT_UNREACHABLE = 3
