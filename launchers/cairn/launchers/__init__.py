"""cairn.launchers: Entry points (train, eval, infer, cache_tasks) and one ml-collections config per experiment.

Modules (imported on use, so `import cairn.launchers` stays light):

* `schema` - every config key once: type, default, allowed values, help (`describe()`);
* `config_base` - `base_config()` (generated from the schema), where every experiment starts, and shared helpers;
* `config_io` - loading experiment files, path resolution (`$BUILD_WORKING_DIRECTORY`), config.json;
* `validation` - `ConfigError` and the checks run before anything is compiled or written;
* `builder` - `load_model`, `make_partitioner`, `make_train_data`, `make_evaluator`, `make_trainer`, ...;
* `data` - vocabulary, task registration, the deterministic cache and reader, the data fingerprint;
* `multihost` - `initialize(config)` (config keys, `$CAIRN_*`, SLURM, TPU pods);
* `post_training` - final evaluation, denoising samples, generated text;
* `run_setup` - the start-up train, eval and infer share (`prepare` -> `RunSetup`; no entry point
  imports another);
* `train_main`, `eval_main`, `infer_main`, `cache_main` - the `//launchers:train`, `eval`, `infer`
  and `cache_tasks` entry points;
* `fingerprint`, `verify`, `plot_loss` - run fingerprints and their comparison, loss curves;
* `tasks.shakespeare` - the Shakespeare tasks of the example experiments.
"""

__version__ = "0.1.0"
