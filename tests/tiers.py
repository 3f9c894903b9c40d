"""The fast tier: ``bash scripts/run_tests.sh --fast`` (``pytest -m fast``).

Chosen by hand, in one place: from every test module the tests that start no job
(the unit tests: parsers, checks of bad input, numpy references, reports, layout,
the server optimizer), and one real 2-worker job per transport:

* parameter server: ``cpsgd`` (compressed and correction rounds, local updates,
  server momentum) against the numpy reference;
* Horovod: ``kvstore='horovod'`` against a 2-worker ``ssgd`` job, to the bit.

tests/conftest.py marks what is listed here; tests/test_tiers.py checks that every
name exists and that every test module is either listed or says why it has no
fast test.  The full suite (what CI runs) is every test, whatever its tier.

Entries: test module -> patterns.  A pattern matches a test by its function name
(``fnmatch``, so ``*`` is every test of the module) or, when it holds ``[``, by its
full name with parameters; a pattern starting with ``!`` takes tests out again.
"""
import fnmatch

FAST = {
    "test_bad_input.py": ["*", "!test_float16_parameters_with_cpsgd_fail_the_job_clearly"],
    "test_bench.py": ["test_host_placement",
                      "test_emulated_compute_releases_layers_in_reverse_order",
                      "test_summarize_*", "test_bench_rejects_bad_time_scale",
                      "test_failure_tail_shows_the_dead_node",
                      "test_plot_workers_scaling_table_and_throughput"],
    "test_bench_scaling.py": ["*"],
    "test_checkpoints.py": ["test_unwritable_checkpoint_dir_is_an_error_before_training"],
    "test_horovod_rerun.py": ["*"],
    "test_compressors.py": ["test_bad_knobs_fail_before_the_first_step",
                            "test_stores_are_registered"],
    "test_cp_compressors.py": ["test_bad_combinations_fail_before_the_first_step"],
    "test_correction_delay.py": ["test_plan_*", "test_a_correction_*", "test_bad_*",
                                 "test_reference_*", "test_unset_*"],
    "test_data.py": ["*"],
    "test_exchange_knob.py": ["*"],
    "test_docs.py": ["*"],
    "test_faults_campaign.py": ["test_plan_covers_every_kind_once_and_is_seeded",
                               "test_every_engine_gets_its_own_kinds_and_launcher"],
    "test_gpu_wheel.py": ["*"],
    "test_help.py": ["*"],
    "test_horovod.py": ["test_horovod_matches_ssgd[kvstore-same]",
                        "test_missing_horovod_says_how_to_install",
                        "test_import_does_not_import_horovod",
                        "test_knob_in_environment_is_rejected"],
    "test_key_layout.py": ["*"],
    "test_knob_table.py": ["*"],
    "test_launch.py": ["test_run_job_rejects_bad_input", "test_free_port_*", "test_parse_env_*",
                       "test_cli_rejects_bad_input", "test_host_file_slots_bound_the_workers"],
    "test_layout.py": ["*"],
    "test_netem.py": ["test_parse_spec*", "test_queue_rejects", "test_dilate_spec",
                      "test_time_scale_rejects"],
    "test_procfs.py": ["*"],
    "test_reference.py": ["test_reference_*", "test_staggered_*",
                          "test_cpsgd_matches_reference[momentum-1server]"],
    "test_rendezvous.py": ["*"],
    "test_report.py": ["*"],
    "test_report_paired.py": ["*"],
    "test_reproduce.py": ["*", "!test_tiny_grid_end_to_end",
                          "!test_interrupted_run_resumes_from_its_checkpoint",
                          "!test_a_run_another_process_is_running_is_left_alone"],
    "test_reproduce_bench.py": ["*", "!test_bench_experiment_end_to_end"],
    "test_scripts.py": ["test_bad_args_exit_2", "test_knobs_passed_only_when_set",
                        "test_lr_convention_sets_the_step_batch",
                        "test_distributed_algorithm_outside_a_job",
                        "test_missing_data_exits_1", "test_rank_path"],
    "test_server_optimizer.py": ["*"],
    "test_slurm.py": ["test_slots_and_tasks_per_node",
                      "test_outside_an_allocation_is_an_error_before_anything_starts"],
    "test_stall.py": ["test_bad_stall_and_restart_input"],
    "test_store_names.py": ["test_misspelt_names_are_refused_by_every_entry_point",
                            "test_near_misses_name_the_store_meant",
                            "test_mxnet_and_project_names_still_create_their_stores"],
    "test_tiers.py": ["*"],
    "test_time_to_accuracy.py": ["*"],
    "test_timed_training.py": ["test_timing_flags_refused", "test_measured_cells_and_projection",
                               "test_spec_placement_and_dilated_rate"],
    "test_worker_momentum.py": ["test_reference_*", "test_bad_settings_are_refused",
                                "test_other_optimizers_are_refused",
                                "test_states_of_the_other_path_are_refused"],
}

#: test modules with no fast test, and why
NO_FAST = {
    "test_cluster.py": "every test builds emulated ssh hosts and runs jobs across them",
    "test_compression_switch.py": "its one test is a job; the cpsgd job of the fast tier "
                                  "flips the switch every correction round",
    "test_equivalence.py": "every test compares real jobs",
    "test_allreduce_launch.py": "its one test stalls and restarts a real Horovod job",
    "test_allreduce_hosts.py": "its tests run Horovod jobs across emulated ssh hosts or "
                               "Slurm nodes, but for two small checks of the same feature",
    "test_failures.py": "every test kills a node of a real job",
    "test_host_wait.py": "every test downs the link of an emulated host under a real job",
    "test_module_api.py": "every test trains through the Module API in a real job",
    "test_mpi.py": "every test starts a real job under mpirun",
    "test_mxlaunch.py": "every test stops a real job under the mxlaunch shim",
    "test_real_models.py": "every test runs a real job",
    "test_resume.py": "every test saves and resumes real jobs",
    "test_security.py": "every test probes the ports of a real job",
}


#: test modules that build emulated hosts (network namespaces with their own
#: sshd, Slurm or MPI daemons): scripts/run_tests.sh runs them one at a time, in a
#: lane of their own beside a second lane with every other test (loopback jobs
#: and unit tests); tests/test_tiers.py checks that every module that builds hosts
#: is listed.  conftest.py marks their tests ``hosts``.
HOST_LANE = (
    "test_allreduce_hosts.py", "test_bench.py", "test_cluster.py",
    "test_faults_campaign.py", "test_host_wait.py", "test_mpi.py", "test_netem.py",
    "test_reproduce_bench.py", "test_slurm.py", "test_timed_training.py",
)

#: loopback test modules that run in the host lane too (in file order among its
#: modules): the host lane spends much of its time waiting on purpose (links down,
#: stall timeouts, daemons restarting), so it finished about 270 s before the other
#: lane on two cores; these (about 120 s of loopback jobs that mostly wait for stalls
#: too) even the two out.  conftest.py marks them ``hosts`` like the modules above.
HOST_LANE_GUESTS = ("test_stall.py",)


def _matches(pattern, name, function):
    if "[" in pattern:
        return name == pattern
    return fnmatch.fnmatchcase(function, pattern)


def is_fast(module, name, function):
    """Whether test ``name`` (function ``function``) of test module ``module`` is fast."""
    fast = False
    for pattern in FAST.get(module, ()):
        if pattern.startswith("!"):
            if _matches(pattern[1:], name, function):
                fast = False
        elif _matches(pattern, name, function):
            fast = True
    return fast
