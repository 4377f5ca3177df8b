# The README's commands. Each installs what it needs first (scripts/setup.sh).
.PHONY: demo test setup bench reliability

demo:
	scripts/demo.sh

test:
	scripts/test.sh

setup:
	scripts/setup.sh

bench:
	bench/run.sh

reliability:
	scripts/reliability.sh
