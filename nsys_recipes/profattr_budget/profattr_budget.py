"""nsys recipe: profattr's per-step budget over one or many reports (the mapper runs once per report).

    NSYS_RECIPE_PATH=<checkout>/nsys_recipes nsys recipe profattr_budget --input run1.nsys-rep run2.nsys-rep

Outputs (in the recipe's output folder): `categories.parquet` / `.csv` (file, device, category, ms_per_step,
count_per_step), `devices.csv` (file, device, step_ms, busy, idle, kernels_per_step, unclassified_share) and one
`<report>.budget.json` per report (the `profattr.budget/1` contract). Needs profattr importable by the Python
that nsys runs the recipe with.
"""
from datetime import datetime
from pathlib import Path

import pandas as pd
from nsys_recipe import log
from nsys_recipe.data_service import DataService
from nsys_recipe.lib import helpers, recipe
from nsys_recipe.lib.args import Option


class ProfattrBudget(recipe.Recipe):
    @staticmethod
    def _mapper_func(report_path, parsed_args):
        from profattr.attribute.budget import compute_budget

        report = Path(report_path)
        sqlite = report.with_suffix(".sqlite")
        if not sqlite.exists() or sqlite.stat().st_mtime < report.stat().st_mtime:
            if not DataService(report).export(None, {"format": "sqlite", "path": str(sqlite)}):
                return None
        budget = compute_budget(sqlite, steps=parsed_args.steps).to_dict()
        return report.stem, budget

    @log.time("Mapper")
    def mapper_func(self, context):
        return context.wait(context.map(self._mapper_func, self._parsed_args.input, parsed_args=self._parsed_args))

    @log.time("Reducer")
    def reducer_func(self, results):
        import json

        results = helpers.filter_none(results)
        cats, devs = [], []
        for name, budget in results:
            Path(self.add_output_file(f"{name}.budget.json")).write_text(json.dumps(budget, indent=2))
            for d in budget["devices"]:
                devs.append({"file": name, "device": d["device"], "step_ms": d["step_ms"],
                             "busy_ms_per_step": d["busy_ms_per_step"], "idle_ms_per_step": d["idle_ms_per_step"],
                             "kernels_per_step": d["kernels_per_step"],
                             "unclassified_share": d["unclassified_share"]})
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
        return parser
