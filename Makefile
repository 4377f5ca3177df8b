# The two commands of the README. Both install what they need first (scripts/setup.sh).
.PHONY: demo test setup

demo:
	scripts/demo.sh

test:
	scripts/test.sh

setup:
	scripts/setup.sh
