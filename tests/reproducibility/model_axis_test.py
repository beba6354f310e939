"""Four hosts feeding one model: the real train entry point on 4 processes x 2 devices with mesh
data=2, model=4 (the model axis spans processes, so two hosts feed each data-parallel replica and
read the same rows) trains what the standard run of 1 process x 8 devices with that mesh trains
(tests/fixtures/standard_runs.py): the global batch of every fingerprinted step identical
(bitwise), losses and parameter sums within rtol 1e-5 (`//launchers:verify`; the processes'
partial sums reach the all-reduces in another order)."""

import standard_runs as sr
import train_runs


def test_four_processes_with_the_model_axis_across_them_match_one(tmp_path):
    standard = sr.unpack(tmp_path)
    many = tmp_path / "four_processes"
    train_runs.train_group(many, standard, 4, 2, sr.MESH_DATA2_MODEL4)
    train_runs.check_matches_one_process(standard.run("t5_data2_model4"), many, 4)
