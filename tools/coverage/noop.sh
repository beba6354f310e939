#!/bin/sh
# Coverage is unsupported offline (see tools/coverage/BUILD).
exit 0
