// The OCI runtime conformance suite of gpuslice's suite (scripts/oci-conformance.sh): the
// validation programs of opencontainers/runtime-tools and the runtimetest they run inside the
// containers, built from the Go module of one pinned revision (the newest on the Go module
// proxy; the module's last release, v0.9.0 of 2019, predates runtime-spec 1.1).
module gpuslice.io/tests/runtime-tools

go 1.26.0

tool (
	github.com/opencontainers/runtime-tools/cmd/runtimetest
	github.com/opencontainers/runtime-tools/validation/config_updates_without_affect
	github.com/opencontainers/runtime-tools/validation/create
	github.com/opencontainers/runtime-tools/validation/default
	github.com/opencontainers/runtime-tools/validation/delete
	github.com/opencontainers/runtime-tools/validation/delete_only_create_resources
	github.com/opencontainers/runtime-tools/validation/delete_resources
	github.com/opencontainers/runtime-tools/validation/hooks
	github.com/opencontainers/runtime-tools/validation/hooks_stdin
	github.com/opencontainers/runtime-tools/validation/hostname
	github.com/opencontainers/runtime-tools/validation/kill
	github.com/opencontainers/runtime-tools/validation/kill_no_effect
	github.com/opencontainers/runtime-tools/validation/killsig
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_blkio
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_cpus
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_devices
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_hugetlb
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_memory
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_network
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_pids
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_relative_blkio
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_relative_cpus
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_relative_devices
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_relative_hugetlb
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_relative_memory
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_relative_network
	github.com/opencontainers/runtime-tools/validation/linux_cgroups_relative_pids
	github.com/opencontainers/runtime-tools/validation/linux_devices
	github.com/opencontainers/runtime-tools/validation/linux_masked_paths
	github.com/opencontainers/runtime-tools/validation/linux_mount_label
	github.com/opencontainers/runtime-tools/validation/linux_ns_itype
	github.com/opencontainers/runtime-tools/validation/linux_ns_nopath
	github.com/opencontainers/runtime-tools/validation/linux_ns_path
	github.com/opencontainers/runtime-tools/validation/linux_ns_path_type
	github.com/opencontainers/runtime-tools/validation/linux_process_apparmor_profile
	github.com/opencontainers/runtime-tools/validation/linux_readonly_paths
	github.com/opencontainers/runtime-tools/validation/linux_rootfs_propagation
	github.com/opencontainers/runtime-tools/validation/linux_seccomp
	github.com/opencontainers/runtime-tools/validation/linux_sysctl
	github.com/opencontainers/runtime-tools/validation/linux_uid_mappings
	github.com/opencontainers/runtime-tools/validation/misc_props
	github.com/opencontainers/runtime-tools/validation/mounts
	github.com/opencontainers/runtime-tools/validation/pidfile
	github.com/opencontainers/runtime-tools/validation/poststart
	github.com/opencontainers/runtime-tools/validation/poststart_fail
	github.com/opencontainers/runtime-tools/validation/poststop
	github.com/opencontainers/runtime-tools/validation/poststop_fail
	github.com/opencontainers/runtime-tools/validation/prestart
	github.com/opencontainers/runtime-tools/validation/prestart_fail
	github.com/opencontainers/runtime-tools/validation/process
	github.com/opencontainers/runtime-tools/validation/process_capabilities
	github.com/opencontainers/runtime-tools/validation/process_capabilities_fail
	github.com/opencontainers/runtime-tools/validation/process_oom_score_adj
	github.com/opencontainers/runtime-tools/validation/process_rlimits
	github.com/opencontainers/runtime-tools/validation/process_rlimits_fail
	github.com/opencontainers/runtime-tools/validation/process_user
	github.com/opencontainers/runtime-tools/validation/root_readonly_true
	github.com/opencontainers/runtime-tools/validation/start
	github.com/opencontainers/runtime-tools/validation/state
)

require (
	github.com/google/uuid v1.3.0 // indirect
	github.com/hashicorp/errwrap v1.0.0 // indirect
	github.com/hashicorp/go-multierror v1.1.1 // indirect
	github.com/mndrix/tap-go v0.0.0-20171203230836-629fa407e90b // indirect
	github.com/moby/sys/capability v0.4.0 // indirect
	github.com/moby/sys/mountinfo v0.7.2 // indirect
	github.com/mrunalp/fileutils v0.5.0 // indirect
	github.com/opencontainers/runtime-spec v1.3.0 // indirect
	github.com/opencontainers/runtime-tools v0.9.1-0.20251114084447-edf4cb3d2116 // indirect
	github.com/opencontainers/selinux v1.9.1 // indirect
	github.com/sirupsen/logrus v1.8.1 // indirect
	github.com/urfave/cli v1.19.1 // indirect
	golang.org/x/sys v0.1.0 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
)
