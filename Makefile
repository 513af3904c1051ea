# Thin wrappers: setup.sh installs what is missing, then does the work.
.PHONY: install demo test test-unit test-vm bench clean

install:
	./setup.sh

demo:
	./setup.sh demo

test:
	./setup.sh test

test-unit:
	./setup.sh test tests/unit -q

# The vm tier alone (`make test` runs it too): Debian kernels under qemu, ~8 min once cached,
# each of its two boots bounded by TESTBED_VM_TIMEOUT seconds (default 600).
test-vm:
	./setup.sh test tests/vm

bench:
	./setup.sh
	.venv/bin/python bench/lab_bringup.py

clean:
	test -x .venv/bin/testbed || ./setup.sh
	.venv/bin/testbed clean --all
