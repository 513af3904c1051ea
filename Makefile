# Thin wrappers: setup.sh installs what is missing, then does the work.
.PHONY: install demo test test-unit test-vm bench clean

install:
	./setup.sh

demo:
	./setup.sh demo

test:
	./setup.sh test

test-unit:
	.venv/bin/python -m pytest tests/unit -q -p no:cacheprovider

# The vm tier alone (`make test` runs it too): Debian kernels under qemu, ~2 min once cached,
# each of its two boots bounded by TESTBED_VM_TIMEOUT seconds (default 600).
test-vm:
	.venv/bin/python -m pytest tests/vm -rs -p no:cacheprovider

bench:
	./setup.sh
	.venv/bin/python bench/lab_bringup.py

clean:
	.venv/bin/testbed clean
