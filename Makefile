# Thin wrappers: setup.sh installs what is missing, then does the work.
.PHONY: install demo test test-unit bench clean

install:
	./setup.sh

demo:
	./setup.sh demo

test:
	./setup.sh test

test-unit:
	.venv/bin/python -m pytest tests/unit -q -p no:cacheprovider

bench:
	./setup.sh
	.venv/bin/python bench/lab_bringup.py

clean:
	.venv/bin/testbed clean
