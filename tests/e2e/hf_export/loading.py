"""What check_export.py and check_peft_export.py share: failing with one line, and collecting
the warnings a library logs while it loads."""

import logging
import sys


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


class Collect(logging.Handler):
    """The messages of WARNING and above logged to the loggers it is added to."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())
