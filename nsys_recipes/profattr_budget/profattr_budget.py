"""nsys recipe: profattr's per-step budget over one or many reports (the mapper runs once per report).

    NSYS_RECIPE_PATH=<checkout>/nsys_recipes nsys recipe profattr_budget --input run1.nsys-rep run2.nsys-rep
    ... --mode dask-futures             reports in parallel on Dask workers (NSYS_DASK_N_WORKERS=4 etc. become
                                        distributed.Client arguments; default: a local cluster)
    ... --merge-ranks                   the reports are the ranks of one tensor-parallel run: also one budget over
                                        all of them, with the collectives' transfer/wait split between ranks

Outputs (in the recipe's output folder): `categories.parquet` / `.csv` (file, device, category, ms_per_step,
count_per_step), `devices.csv` (file, device, step_ms, busy, idle, kernels_per_step, unclassified_share) and one
`<report>.budget.json` per report (the `profattr.budget/1` contract); with --merge-ranks the merged budget is the
file `merged` in both tables and `merged.budget.json`. Needs profattr importable by the Python that nsys runs the
recipe with (and by the Dask workers); each report's op arrays land in profattr's budget cache, so the merge reads
no SQLite again.
"""
from datetime import datetime
from pathlib import Path

import pandas as pd
from nsys_recipe import log
from nsys_recipe.lib import helpers, recipe
from nsys_recipe.lib.args import Option


class ProfattrBudget(recipe.Recipe):
    @log.time("Mapper")
    def mapper_func(self, context):
        # a profattr function (importable on every worker), not a method of this class: Dask sends it by name
        from profattr.attribute.many import report_budget

        return context.wait(context.map(report_budget, self._parsed_args.input, steps=self._parsed_args.steps,
                                        export_with_recipe=True))

    @log.time("Reducer")
    def reducer_func(self, results):
        import json

        results = list(helpers.filter_none(results))
        if self._parsed_args.merge_ranks:
            from profattr.attribute.many import merged_budget

            merged = merged_budget(self._parsed_args.input, steps=self._parsed_args.steps,
                                   export_with_recipe=True).to_dict()
            results.append(("merged", merged))
        cats, devs = [], []
        for name, budget in results:
            Path(self.add_output_file(f"{name}.budget.json")).write_text(json.dumps(budget, indent=2))
            for d in budget["devices"]:
                row = {"file": name, "device": d["device"], "step_ms": d["step_ms"],
                       "busy_ms_per_step": d["busy_ms_per_step"], "idle_ms_per_step": d["idle_ms_per_step"],
                       "kernels_per_step": d["kernels_per_step"],
                       "unclassified_share": d["unclassified_share"]}
                if d.get("comm"):
                    row["comm_wait_ms_per_step"] = d["comm"]["wait_ms_per_step"]
                    row["comm_transfer_ms_per_step"] = d["comm"]["transfer_ms_per_step"]
                devs.append(row)
                for c in d["categories"]:
                    cats.append({"file": name, "device": d["device"], **c})
        cat_df, dev_df = pd.DataFrame(cats), pd.DataFrame(devs)
        cat_df.to_parquet(self.add_output_file("categories.parquet"))
        cat_df.to_csv(self.add_output_file("categories.csv"), index=False)
        dev_df.to_csv(self.add_output_file("devices.csv"), index=False)

    def run(self, context):
        super().run(context)
        self.reducer_func(self.mapper_func(context))
        self._analysis_dict.update({"EndTime": str(datetime.now()), "InputFiles": self._parsed_args.input,
                                    "Outputs": self._output_files})
        self.create_analysis_file()

    @classmethod
    def get_argument_parser(cls):
        parser = super().get_argument_parser()
        parser.add_recipe_argument(Option.INPUT)
        parser.add_recipe_argument(Option.OUTPUT)
        parser.add_recipe_argument(Option.FORCE_OVERWRITE)
        parser.add_argument("--steps", default="auto",
                            help="auto | whole | graph | nvtx:NAME (as `profattr budget --steps`)")
        parser.add_argument("--merge-ranks", action="store_true",
                            help="the reports are the ranks of one run: also one budget over all of them, with "
                                 "the collectives' transfer/wait split")
        return parser
