# Aleph Gateway: `make serve` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ALEPH_BIND ?= 127.0.0.1:8000
export ALEPH_BIND

.PHONY: serve test bench lint system venv node

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

venv: $(VENV)/.installed

# MCP reference peers (server-everything, the Inspector CLI), pinned in package-lock.json; tests run node_modules/.bin.
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

node: node_modules/.installed

# Debian packages the gateway runs: bubblewrap (sandbox) and chromium (browser tools and browser tests).
system:
	@missing=""; \
	command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "Installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "Missing Debian packages:$$missing (not root, or no apt-get: install them, or the tests that need them are skipped)"; \
	  fi; \
	fi

serve: venv system node
	$(PY) manage.py migrate --noinput -v0
	$(PY) manage.py seed_demo
	@echo "Aleph is serving on http://$(ALEPH_BIND)/  (API: http://$(ALEPH_BIND)/api/v1/, docs: http://$(ALEPH_BIND)/api/v1/schema/docs/)"
	$(VENV)/bin/daphne -b $$(echo $(ALEPH_BIND) | sed 's/:[0-9]*$$//; s/^\[//; s/\]$$//') -p $${ALEPH_BIND##*:} aleph_site.asgi:application

test: venv system node
	$(PY) -m pytest

bench: venv system node
	$(PY) bench/run.py

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run
