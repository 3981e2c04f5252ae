# Shortcuts for the scripts (the README's two commands are scripts/demo.sh and scripts/test.sh,
# which also work where make is not installed yet).
BUILD ?= build
export BUILD

.PHONY: all build test demo bench clean
all: build
build:
	scripts/build.sh
test:
	scripts/test.sh
demo:
	scripts/demo.sh
bench: build
	scripts/bench.sh $(BUILD)
clean:
	rm -rf $(BUILD)
