# csi-addons-rs. The two commands a newcomer needs: `make demo` and `make test`.
SHELL := /usr/bin/env bash
CARGO ?= cargo

.PHONY: test-shipped test-one cluster-start cluster-tests cluster-faults cluster-driver-operator cluster-rbac-audit olm-start olm-tests prometheus-tests test-all code-order test-faults-cluster olm-up prometheus-up operatorhub freeze-release test-olm demo-cluster cluster-up cluster-down cluster-install test-cluster ship-binaries fuzz test-interop demo-down bundle bundle-validate bundle-build helm-template all build test bench test-faults test-peers lint manifests check-manifests control-plane protos demo fmt clippy help docker-build kustomize-build deploy-yamls

all: build

# The target the shipped binaries are built for: static musl where the machine can build it (see the script).
# Evaluated once, at first use (its warning is printed once; other targets never run it).
SHIP_TARGET = $(eval SHIP_TARGET := $$(shell hack/static-target.sh))$(SHIP_TARGET)
# Where `make ship-binaries` leaves them: one profile, one target directory.
SHIP_DIR = target/$(SHIP_TARGET)/ship
SHIP_BINS = --bin csi-addons-manager --bin csi-addons-sidecar --bin csi-addons --bin reference-driver --bin csi-node-registrar --bin reference-driver-operator

# The musl targets' linker, at one path per machine (hack/ship-linker.sh says why): cargo's cached
# output of the shipped build then serves every clone.
SHIP_LINKER_ENV = $(if $(filter %-musl,$(SHIP_TARGET)),CARGO_TARGET_$(shell echo '$(SHIP_TARGET)' | tr 'a-z-' 'A-Z_')_LINKER="$$(hack/ship-linker.sh)" CSI_ADDONS_LINK_ORDERED="$(CURDIR)/hack/link-ordered.sh")

ship-binaries: ## Build every shipped binary, static, in the one `ship` profile and one cargo call (and the futures' size probe in the same profile)
	$(SHIP_LINKER_ENV) $(CARGO) build --profile ship --locked --target $(SHIP_TARGET) -p operator -p sidecar -p reference-driver -p driver-operator $(SHIP_BINS) --example future_sizes

test-shipped: ship-binaries ## The checks of the shipped build itself: the reconcile futures' sizes in its profile, and its linker's code order (build/code-order/ still names its functions)
	FUTURE_SIZES="$$PWD/$(SHIP_DIR)/examples/future_sizes" $(CARGO) test --locked -p integration-tests --test checks shipped:: -- --ignored

code-order: control-plane ## Profile the manager and sidecar under callgrind in the benchmark's parts and rewrite build/code-order/ (the functions the shipped link puts first; about 10 min)
	hack/code-order.sh

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

build: ## Build every crate (debug)
	$(CARGO) build --workspace --locked

# Where the Go-built peers are (each built once into the cache), for `make test-one`, which builds
# them all before its one test. tests/README.md lists every variable the suites read.
TEST_ENV = KUBEBUILDER_ASSETS="$$(hack/control-plane.sh)" CSI_SANITY="$$(hack/csi-sanity.sh)" KUSTOMIZE="$$(hack/kustomize.sh)" \
	PROMETHEUS_CRDS="$$(hack/prometheus-crds.sh)" PROMETHEUS_DEB_DIR="$$(hack/prometheus-deb.sh)" OPERATOR_SDK_DIR="$$(hack/operator-sdk.sh)" HELM="$$(hack/helm.sh)" \
	CSI_PROVISIONER="$$(hack/csi-provisioner.sh)"

test: ## Run every test: unit tests, then the suites on a real kube-apiserver + etcd
	# The suites run the project's binaries as real processes: build them first. The Go-built peers'
	# variables are left unset: each suite asks hack/<peer>.sh for its peer when it first needs one
	# (tests/lib.rs, test_peer), which waits on that peer's lock while .ci/run's background build
	# (hack/go-peers.sh) makes it. So the suites start once the control plane is built, not once
	# every peer is, and on an empty machine the Rust builds, the suites and the Go builds overlap.
	# The shipped build's own checks are `make test-shipped`'s: its fat-LTO build alone took 28 min
	# of a cold run.
	$(CARGO) build --workspace --bins --locked
	$(CARGO) test --workspace --locked --no-run
	$(CARGO) test --workspace --locked

# test-one's test binary: empty for every binary of the workspace, or `cluster` for tests/cluster.
TEST ?=
test-one: control-plane test-peers ## Run the tests whose names contain T (ignored ones too), with make test's environment: `make test-one T=manager::jobs::`; TEST=cluster runs tests/cluster's inside a running cluster (make cluster-start first)
	@[ -n "$(T)" ] || { echo "test-one: say which tests: make test-one T=<part of a test's name> [TEST=cluster]" >&2; exit 2; }
	$(CARGO) build --workspace --bins --locked
	@if [ "$(TEST)" = cluster ]; then \
	  [ -e /run/netns/$${CLUSTER_NETNS:-csi-addons-cluster} ] || { echo "test-one: no cluster is running: make cluster-start first" >&2; exit 1; }; \
	  set -x; hack/cluster.sh exec env HELM="$$(hack/helm.sh)" OPERATOR_SDK_DIR="$$(hack/operator-sdk.sh)" NEXT_VERSION=$(NEXT_VERSION) $(CARGO) test --offline --locked -p integration-tests --test cluster -- --include-ignored --test-threads=1 --nocapture "$(T)"; \
	else \
	  set -x; $(TEST_ENV) $(CARGO) test --workspace --locked -- --include-ignored --nocapture "$(T)"; \
	fi

test-interop: control-plane ## The story's reclaim, fence and replication steps with upstream's v0.14.0 manager or sidecar as the other half (builds upstream's once)
	@hack/csi-provisioner.sh >/dev/null
	@hack/upstream-binaries.sh >/dev/null
	$(CARGO) build --workspace --bins --locked
	$(CARGO) test --locked -p integration-tests --test integration --no-run
	# One pair at a time: each runs a control plane and a whole stack of its own. All in a network
	# namespace of their own (loopback only, nothing reaches the host's), where the tests capture
	# the pairs' TLS handshakes; built above, so cargo needs no network in it.
	KUBEBUILDER_ASSETS="$$(hack/control-plane.sh)" CSI_PROVISIONER="$$(hack/csi-provisioner.sh)" \
	UPSTREAM_BINARIES="$$(hack/upstream-binaries.sh)" \
	unshare --net sh -c 'ip link set lo up && exec "$$@"' interop \
	$(CARGO) test --offline --locked -p integration-tests --test integration stack::interop:: -- --ignored --test-threads=1 --nocapture

fuzz: control-plane ## Hostile input for every parser of outside input: 100,000 proptest cases each (make test runs 256)
	$(CARGO) build --workspace --bins --locked
	KUBEBUILDER_ASSETS="$$(hack/control-plane.sh)" PROPTEST_CASES=$${PROPTEST_CASES:-100000} \
	$(CARGO) test --locked -p integration-tests --test integration hostile -- --nocapture --test-threads=1

BENCH ?= benches::
bench: control-plane ## Ours next to upstream's v0.14.0 on one control plane: annotation fan-out (N=1,000 and 10,000), job throughput (ours at 1,000 and 10,000 jobs, upstream at 1,000; BENCH_JOBS), idle with 1,000 CSIAddonsNodes, sidecar RSS; JSON and plots in bench-results/ (BENCH=bench_jobs for one part)
	$(MAKE) --no-print-directory ship-binaries
	$(CARGO) build --workspace --bins --locked
	KUBEBUILDER_ASSETS="$$(hack/control-plane.sh)" TESTENV_AUDIT=1 \
	UPSTREAM_MANAGER="$$(hack/upstream-binaries.sh manager)" UPSTREAM_SIDECAR="$$(hack/upstream-binaries.sh sidecar)" \
	UPSTREAM_RBAC="$$(hack/upstream-binaries.sh rbac)" \
	CSI_ADDONS_MANAGER="$$PWD/$(SHIP_DIR)/csi-addons-manager" \
	CSI_ADDONS_SIDECAR="$$PWD/$(SHIP_DIR)/csi-addons-sidecar" REFERENCE_DRIVER="$$PWD/$(SHIP_DIR)/reference-driver" \
	$(CARGO) test --locked -p integration-tests --test integration $(BENCH) -- --ignored --nocapture --test-threads=1

test-faults: control-plane ## kill -9 the manager, sidecar, driver or kube-apiserver, or the leading manager, mid-batch: no job stuck or lost (prints a table)
	$(CARGO) build --workspace --bins --locked
	KUBEBUILDER_ASSETS="$$(hack/control-plane.sh)" \
	$(CARGO) test --locked -p integration-tests --test integration stack::faults:: -- --ignored --nocapture --test-threads=1

# The one-node cluster (hack/cluster.sh): kubelet, containerd, runc, CNI, kube-proxy, CoreDNS and a
# registry, built from source into the cache, all inside a network namespace of their own.
cluster-up: ship-binaries ## Start the one-node cluster in its network namespace and push the images built from build/*.Dockerfile to its registry (first time: about 15 min of builds)
	hack/cluster.sh up
	hack/images.sh $(SHIP_DIR) $(IMAGE_TAG)

cluster-down: ## Stop the one-node cluster and remove every trace of it (processes, mounts, loop devices, namespaces, iptables rules)
	hack/cluster.sh down

cluster-install: ## Install deploy/controller/ and deploy/reference-driver/ into the running cluster, images from its registry
	hack/cluster-install.sh controller
	hack/cluster-install.sh driver

# demo-cluster's driver: `hand` (deploy/reference-driver/) or `operator` (the driver operator and its sample ReferenceCSIDriver).
DRIVER ?= hand

demo-cluster: ## make demo's story in real Pods, on a fresh `make cluster-up`: installs deploy/controller/ and the driver (DRIVER=hand: deploy/reference-driver/; DRIVER=operator: through the driver operator), then prints each step's measured effect and time
	$(CARGO) test --locked -p integration-tests --test cluster --no-run
	hack/cluster-install.sh controller
	@if [ "$(DRIVER)" = operator ]; then set -ex; \
	  hack/cluster-install.sh driver-operator; \
	  hack/cluster-install.sh driver-from-operator; \
	  hack/cluster.sh exec env STORY_STORAGE_CLASS=reference-csi-filesystem $(CARGO) test --offline --locked -q -p integration-tests --test cluster story -- --ignored --nocapture --test-threads=1; \
	else set -ex; \
	  hack/cluster-install.sh driver; \
	  hack/cluster.sh exec $(CARGO) test --offline --locked -q -p integration-tests --test cluster story -- --ignored --nocapture --test-threads=1; \
	fi

# The cluster tiers (.ci/suites.toml): each runs on a cluster one of the two starts below left running,
# `.ci/tiers.py` starting, sharing and stopping them; the targets after them run those tiers on fresh
# clusters, whatever the time, and remove everything at the end (and check).
cluster-start: ship-binaries ## A fresh one-node cluster with the images pushed and deploy/controller/ and deploy/reference-driver/ installed, left running (the cluster tiers' start)
	$(CARGO) test --locked -p integration-tests --test cluster --no-run
	@hack/cluster.sh check || { echo "cluster-start: a cluster is running or left traces; make cluster-down first" >&2; exit 1; }
	hack/cluster.sh up
	hack/images.sh $(SHIP_DIR) $(IMAGE_TAG)
	hack/cluster-install.sh controller
	hack/cluster-install.sh driver

cluster-tests: ## On cluster-start's cluster: tests/cluster's suites (the story, the driver's and the manager's Pods, leader failover, the Helm chart, hostile input)
	HELM="$$(hack/helm.sh)"; hack/cluster.sh exec env HELM="$$HELM" $(CARGO) test --offline --locked -p integration-tests --test cluster -- --ignored --test-threads=1 --skip olm --skip readme_helm --skip prometheus --skip driver_operator --skip rbac_audit --skip faults_cluster

cluster-faults: ## On cluster-start's cluster: the fault table (FAULTS=kubelet,full picks rows by batch name)
	hack/cluster.sh exec $(CARGO) test --offline --locked -p integration-tests --test cluster faults_cluster:: -- --ignored --test-threads=1 --nocapture

cluster-driver-operator: ## On cluster-start's cluster: the hand-installed driver replaced by the driver operator's, then its suite
	hack/cluster-install.sh remove-driver
	hack/cluster-install.sh driver-operator
	hack/cluster.sh exec $(CARGO) test --offline --locked -p integration-tests --test cluster driver_operator:: -- --ignored --test-threads=1 --nocapture

cluster-rbac-audit: ## On the cluster the other cluster tiers ran on: the API server's audit log against the shipped RBAC
	hack/cluster.sh exec $(CARGO) test --offline --locked -p integration-tests --test cluster rbac_audit:: -- --ignored --nocapture

olm-start: ship-binaries ## A fresh one-node cluster with the images, this release's next bundle, OLM v0.33.0 (hack/olm.sh) and a catalog of both releases, left running (the OLM tiers' start)
	$(CARGO) test --locked -p integration-tests --test cluster --no-run
	@hack/cluster.sh check || { echo "olm-start: a cluster is running or left traces; make cluster-down first" >&2; exit 1; }
	hack/cluster.sh up
	hack/images.sh $(SHIP_DIR) $(IMAGE_TAG)
	next="$$(mktemp -d)"; $(MAKE) -s bundle VERSION=$(NEXT_VERSION) BUNDLE_OUT="$$next" >/dev/null 2>&1 && \
	hack/images.sh --next-bundle "$$next" $(IMAGE_TAG) v$(NEXT_VERSION); status=$$?; rm -rf "$$next"; exit $$status
	hack/olm.sh up
	DRIVER_OPERATOR_VERSION=$(VERSION) hack/catalog.sh v$(NEXT_VERSION) $(VERSION) $(NEXT_VERSION)

# A cluster test run in the cluster's network namespace, with the peers the OLM tiers' tests use.
OLM_RUN = hack/cluster.sh exec env OPERATOR_SDK_DIR="$$(hack/operator-sdk.sh)" HELM="$$(hack/helm.sh)" NEXT_VERSION=$(NEXT_VERSION) \
	$(CARGO) test --offline --locked -p integration-tests --test cluster -- --ignored --test-threads=1 --nocapture

olm-tests: ## On olm-start's cluster: the README's Helm command, then the bundle installed by operator-sdk, upgraded to the next version's, from a catalog by a Subscription, scorecard in Pods; the driver operator subscribed to, OLM resolving csi-addons as its dependency
	$(OLM_RUN) readme_helm
	$(OLM_RUN) olm --skip olm_driver
	$(OLM_RUN) olm_driver

prometheus-tests: ## On a cluster the OLM tiers started: the release YAMLs and the driver, scraped by a Prometheus the Prometheus Operator runs (hack/prometheus.sh) while the story runs
	hack/cluster-install.sh controller
	hack/cluster-install.sh driver
	hack/prometheus.sh up
	$(OLM_RUN) prometheus

test-cluster: ## The product in real Pods, on a fresh one-node cluster: the cluster, cluster-faults, driver-operator and rbac-audit tiers (cluster-tests, cluster-faults, cluster-driver-operator, cluster-rbac-audit), then everything removed (and checked)
	python3 .ci/tiers.py run --only cluster,cluster-faults,driver-operator,rbac-audit

test-faults-cluster: ## Faults a real cluster has, on a fresh one-node cluster with the release YAMLs and the driver: the kubelet restarted, containerd restarted, the driver hung, the leading manager and the node plugin evicted, the API server shedding the manager's load (429), the driver's disk full, the node rebooted, the controller plugin's sidecar cut off from the manager for 60 s while a second driver's jobs must all finish, 10,000 PVCs fanned out into cron jobs within the manager's memory limit, each in the middle of 200 ReclaimSpaceJobs (one per volume) and a VolumeReplication changing state; no job stuck or lost (prints the table of make test-faults; FAULTS=kubelet,full picks rows by batch name)
	python3 .ci/tiers.py run --only cluster-faults

test-olm: ## OLM and Prometheus for real, on a fresh one-node cluster: the olm and prometheus tiers (olm-start, olm-tests, prometheus-tests), then everything removed (and checked)
	python3 .ci/tiers.py run --only olm,prometheus

test-all: ## Every CI tier (.ci/suites.toml), whatever the time: lint, make test, interop, faults, then every cluster tier
	python3 .ci/tiers.py run --all

olm-up: ## On a running cluster (make cluster-up): build OLM v0.33.0 and opm here (once, cached) and install OLM
	hack/olm.sh up

prometheus-up: ## On a running cluster (make cluster-up): build the Prometheus Operator v0.85.0 and Prometheus 3.5.0 here (once, cached) and run them
	hack/prometheus.sh up

IMAGE_REGISTRY ?= ghcr.io/csi-addons-rs
# The release this tree is (Cargo.toml's version); VERSION=x.y.z builds images and a bundle of
# another, the bundle then replacing this release's CSV (OLM's upgrade path).
RELEASED_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
VERSION ?= $(RELEASED_VERSION)
IMAGE_TAG ?= v$(VERSION)

# BUILD_ARGS go to every image build: `BUILD_ARGS="--build-arg BINARIES=<image>"` takes the binaries
# from an image holding them in /out instead of compiling them in the Rust image (see build/*.Dockerfile).
docker-build: ## Build the manager, sidecar, reference-driver and reference-driver-operator images with docker, podman or buildah, whichever works here (CONTAINER_ENGINE to choose)
	@engine="$$(hack/container-engine.sh)" && set -x && \
	$$engine build $(BUILD_ARGS) -f build/manager.Dockerfile -t $(IMAGE_REGISTRY)/csi-addons-manager:$(IMAGE_TAG) . && \
	$$engine build $(BUILD_ARGS) -f build/sidecar.Dockerfile -t $(IMAGE_REGISTRY)/csi-addons-sidecar:$(IMAGE_TAG) . && \
	$$engine build $(BUILD_ARGS) -f build/driver.Dockerfile -t $(IMAGE_REGISTRY)/reference-driver:$(IMAGE_TAG) . && \
	$$engine build $(BUILD_ARGS) -f build/driver-operator.Dockerfile -t $(IMAGE_REGISTRY)/reference-driver-operator:$(IMAGE_TAG) .

kustomize-build: ## Render config/default (kustomize built once from the Go module proxy)
	@"$$(hack/kustomize.sh)" build config/default

DEPLOY_HEADER = \# Generated by `make deploy-yamls` from config/ (kustomize); do not edit.

deploy-yamls: ## Render deploy/controller/{crds,rbac,setup-controller,admission-policy}.yaml and deploy/driver-operator/driver-operator.yaml, the release YAMLs for users without OLM
	@K="$$(hack/kustomize.sh)"; \
	for pair in crds:crds rbac:rbac setup:setup-controller admission:admission-policy; do \
	  { echo '$(DEPLOY_HEADER)'; "$$K" build config/release/$${pair%%:*}; } > deploy/controller/$${pair#*:}.yaml || exit 1; \
	done; \
	mkdir -p deploy/driver-operator; \
	{ echo '# Generated by `make deploy-yamls` from driver-operator/config/ (kustomize); do not edit.'; \
	  "$$K" build driver-operator/config/default; } > deploy/driver-operator/driver-operator.yaml

# The release date written as the CSV's createdAt: fixed, so regenerating bundle/ gives no diff.
RELEASE_DATE ?= 2026-11-23T00:00:00Z
# The version test-olm upgrades to: this release's next patch, its bundle built from this tree.
NEXT_VERSION ?= $(shell echo $(RELEASED_VERSION) | awk -F. '{ print $$1 "." $$2 "." $$3 + 1 }')
BUNDLE_REPLACES ?= $(if $(filter $(RELEASED_VERSION),$(VERSION)),,csi-addons.v$(RELEASED_VERSION))
BUNDLE_OUT ?= .
BUNDLE_IMAGE ?= $(IMAGE_REGISTRY)/csi-addons-bundle:$(IMAGE_TAG)

bundle: ## Regenerate bundle/ and bundle.Dockerfile from config/manifests, and the driver operator's (driver-operator/bundle/, depending on the csi-addons package) from driver-operator/config/manifests (operator-sdk built once from the Go module proxy)
	BUNDLE_CREATED_AT=$(RELEASE_DATE) IMAGE_TAG=$(IMAGE_TAG) VERSION=$(VERSION) REPLACES=$(BUNDLE_REPLACES) hack/bundle.sh $(BUNDLE_OUT)
	mkdir -p $(BUNDLE_OUT)/driver-operator
	BUNDLE_CREATED_AT=$(RELEASE_DATE) IMAGE_TAG=$(IMAGE_TAG) VERSION=$(VERSION) PACKAGE=reference-driver-operator SOURCE=driver-operator \
	  DEPENDS='csi-addons:>=$(RELEASED_VERSION)' RELATED_IMAGES='$(DRIVER_OPERATOR_IMAGES)' hack/bundle.sh $(BUNDLE_OUT)/driver-operator

# The images the driver operator runs and installs (its bundle's relatedImages).
DRIVER_OPERATOR_IMAGES = reference-driver-operator=ghcr.io/csi-addons-rs/reference-driver-operator:$(IMAGE_TAG) \
  reference-driver=ghcr.io/csi-addons-rs/reference-driver:$(IMAGE_TAG) csi-addons-sidecar=ghcr.io/csi-addons-rs/csi-addons-sidecar:$(IMAGE_TAG) \
  csi-provisioner=registry.k8s.io/sig-storage/csi-provisioner:v6.3.0 csi-attacher=registry.k8s.io/sig-storage/csi-attacher:v4.13.0 \
  csi-resizer=registry.k8s.io/sig-storage/csi-resizer:v2.3.0

OPERATORHUB_OUT ?= target/operatorhub

operatorhub: ## Write the bundle in the community-operators layout (operators/csi-addons/<version>/ and ci.yaml) into OPERATORHUB_OUT and validate it (operatorframework and community validators)
	hack/operatorhub.sh $(OPERATORHUB_OUT)

freeze-release: ## Freeze this release's CRDs and samples in config/released/v$(VERSION)/: later CRDs are checked against them (tests/integration/packaging/crd_compat.rs)
	mkdir -p config/released/v$(VERSION)/crds config/released/v$(VERSION)/samples
	cp config/crd/bases/*.yaml config/released/v$(VERSION)/crds/
	cp config/samples/*_*.yaml config/released/v$(VERSION)/samples/

bundle-validate: ## Validate bundle/ with operator-sdk (operatorframework suite) and scorecard's static tests
	hack/bundle-validate.sh

bundle-build: ## Build the bundle image (from BUNDLE_OUT) with docker, podman or buildah, whichever works here
	@engine="$$(hack/container-engine.sh)" && set -x && $$engine build -f $(BUNDLE_OUT)/bundle.Dockerfile -t $(BUNDLE_IMAGE) $(BUNDLE_OUT)

HELM_NAMESPACE ?= csi-addons-system

helm-template: ## Render the Helm chart (helm built once from the Go module proxy)
	@"$$(hack/helm.sh)" template csi-addons charts/csi-addons --namespace $(HELM_NAMESPACE) --include-crds

manifests: ## Regenerate config/crd/bases from the Rust types, then every file that carries the CRDs: the Helm chart's copy and the release YAMLs (make deploy-yamls)
	$(CARGO) run -q --locked -p api --bin crdgen -- --dir config/crd/bases
	cp config/crd/bases/*.yaml charts/csi-addons/crds/
	@$(MAKE) --no-print-directory deploy-yamls

check-manifests: ## Fail if config/crd/bases differs from what the Rust types generate
	$(CARGO) run -q --locked -p api --bin crdgen -- --dir config/crd/bases --check

test-peers: ## Build or fetch (once, cached outside the clone) csi-sanity, csi-provisioner, kustomize, helm, operator-sdk, the Prometheus Operator CRDs and Debian's promtool
	@hack/csi-sanity.sh >/dev/null
	@hack/kustomize.sh >/dev/null
	@hack/helm.sh >/dev/null
	@hack/operator-sdk.sh >/dev/null
	@hack/prometheus-crds.sh >/dev/null
	@hack/prometheus-deb.sh >/dev/null
	@hack/csi-provisioner.sh >/dev/null

control-plane: ## Build (once, cached outside the clone) etcd, kube-apiserver, kube-controller-manager, kubectl
	@hack/control-plane.sh >/dev/null

protos: ## Re-fetch the .proto files from the Go module proxy into api/proto
	hack/update-protos.sh

demo: control-plane ## A local control plane with the manager, sidecars, csi-provisioner and the reference driver running every operation
	@hack/csi-provisioner.sh >/dev/null
	$(CARGO) build --locked -p demo -p operator -p sidecar -p reference-driver --bins
	@KUBEBUILDER_ASSETS="$$(hack/control-plane.sh)" CSI_PROVISIONER="$$(hack/csi-provisioner.sh)" hack/demo.sh

demo-down: ## Stop the demo's cluster and everything it started
	@hack/demo-down.sh

fmt: ## Format the code
	$(CARGO) fmt --all

clippy: ## Lint with clippy (warnings are errors)
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

lint: clippy ## Check formatting, lint, that no crate's modules import each other in a circle, that every relative link in the Markdown resolves, and that CONTRIBUTING.md's CI table is .ci/suites.toml's
	$(CARGO) fmt --all --check
	python3 hack/check-links.py
	python3 .ci/tiers.py check-doc CONTRIBUTING.md
	python3 hack/import-cycles.py --workspace
