def write_report(run_dir): raise NotImplementedError
