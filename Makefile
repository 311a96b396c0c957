# Every set-up step lives here: `make run` and `make test` work on a fresh Debian machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py decider/placement/_entry_index.c | sha1sum | cut -c1-12)

.PHONY: run test test-fast test-lowest lint pytest pytest-fast rules fake-nvml bench bench-rules bench-rules-sharded bench-decider clean debian-packages mutation dashboards

# The main job: the demo (docs/simulation.md): a simulated site, a real Prometheus and
# Alertmanager and the decider telling their story; Ctrl-C stops it.
run: $(STAMP) debian-packages
	$(BIN)/llmgw-facility demo

test: lint pytest rules test-lowest

# The same without the tests that start real servers or a browser (marked in tests/conftest.py):
# about two minutes on 2 cores (docs/testing.md), for the edit-test loop; `make test` (CI) runs all.
test-fast: lint pytest-fast rules

$(STAMP): pyproject.toml setup.py decider/placement/_entry_index.c
	PYTHON=$(PYTHON) scripts/debian-packages.sh py:ensurepip=python3-venv gcc=gcc include:Python.h=python3-dev
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

debian-packages:
	scripts/debian-packages.sh promtool=prometheus prometheus-alertmanager=prometheus-alertmanager vmalert=victoria-metrics gcc=gcc \
		chromium=chromium openssl=openssl ipmi_sim=openipmi ipmitool=ipmitool ipmi-sensors=freeipmi-tools \
		prometheus-snmp-exporter=prometheus-snmp-exporter

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

pytest: $(STAMP) debian-packages fake-nvml
	$(BIN)/python -m pytest

pytest-fast: $(STAMP) debian-packages fake-nvml
	$(BIN)/python -m pytest -m "not servers and not browser"

# The lowest versions pyproject.toml allows (scripts/lowest_requirements.py), in a second
# virtual environment made anew when pyproject.toml changes: ruff, and the decider's API and
# core and the exporter's tests run there, so that every lower bound is a version that works.
# The code is read from the tree (its C loop built there by the first environment, which also
# installs python3-venv: hence made first).
LOWEST := .venv-lowest
LOWEST_STAMP := $(LOWEST)/.installed-$(shell cat pyproject.toml scripts/lowest_requirements.py | sha1sum | cut -c1-12)
LOWEST_TESTS := tests/test_decider_api.py tests/test_json_body_route.py tests/test_facility.py \
	tests/test_placement.py tests/test_decider_store.py tests/test_config.py tests/test_gpu.py \
	tests/test_hwmon.py tests/test_hwmon_power.py tests/test_rapl.py tests/test_units.py \
	tests/test_units_amd.py tests/test_ipmi.py tests/test_redfish.py tests/test_redfish_tls.py \
	tests/test_cray.py tests/test_poller.py tests/test_node_power.py tests/test_fake_nvml.py \
	tests/test_exporter_e2e.py

test-lowest: $(LOWEST_STAMP) $(STAMP) debian-packages fake-nvml
	$(LOWEST)/bin/ruff check .
	$(LOWEST)/bin/ruff format --check .
	PYTHONPATH=$(CURDIR) $(LOWEST)/bin/python -m pytest -q $(LOWEST_TESTS)

$(LOWEST_STAMP): pyproject.toml scripts/lowest_requirements.py | $(STAMP)
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install -q --upgrade pip
	$(LOWEST)/bin/python scripts/lowest_requirements.py test > $(LOWEST)/requirements.txt
	$(LOWEST)/bin/python -m pip install -q -r $(LOWEST)/requirements.txt
	touch $@

rules: debian-packages
	@files=$$(find rules alerts -name '*.yml' | sort); \
	if [ -n "$$files" ]; then promtool check rules --lint-fatal $$files; \
	else echo "rules/ and alerts/ hold no rule files yet"; fi
	@tests=$$(find tests/rules -name '*_test.yml' 2>/dev/null | sort); \
	if [ -n "$$tests" ]; then promtool test rules $$tests; \
	else echo "no promtool rule tests yet"; fi

fake-nvml: tests/fake_nvml/libnvidia-ml.so.1

tests/fake_nvml/libnvidia-ml.so.1: tests/fake_nvml/fake_nvml.c
	gcc -shared -fPIC -O2 -Wall -Wextra -Werror -o $@.tmp $< && mv $@.tmp $@

# The Grafana dashboards' JSON, from dashboards/generate.py (docs/dashboards.md).
dashboards: $(STAMP)
	$(BIN)/python dashboards/generate.py

bench: $(STAMP)
	scripts/debian-packages.sh prometheus-node-exporter=prometheus-node-exporter promtool=prometheus gcc=gcc
	$(BIN)/python benchmarks/exporter_scrape.py --check

bench-rules: $(STAMP) debian-packages
	$(BIN)/python benchmarks/rules_eval.py

# The layers of docs/rules.md sharded: 3,000 nodes over 3 Prometheus shards, a global
# Prometheus and VictoriaMetrics + vmalert side by side (docs/benchmarks.md, docs/scaling.md).
bench-rules-sharded: $(STAMP) debian-packages
	$(BIN)/python benchmarks/rules_sharded.py --nodes 3000 --shards 3 \
	  --node-layer rules/node.yml --node-layer rules/energy.yml \
	  --node-layer alerts/exporter.yml --node-layer alerts/domain.yml:llmgw-gpu.alerts

bench-decider: $(STAMP)
	$(BIN)/python benchmarks/decider_placement.py

# Mutation testing of the placement rules, killed by their own tests (docs/mutation.md):
# a clean run, MUTMUT_CHILDREN test processes at a time.
MUTMUT_CHILDREN ?= 2
mutation: $(STAMP)
	test -x $(BIN)/mutmut || $(BIN)/python -m pip install -q -e '.[test,mutation]'
	rm -rf mutants
	$(BIN)/mutmut run --max-children $(MUTMUT_CHILDREN)
	$(BIN)/mutmut results

clean:
	rm -rf $(VENV) $(LOWEST) tests/fake_nvml/libnvidia-ml.so.1 .pytest_cache .ruff_cache
