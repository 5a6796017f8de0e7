"""What the config's fields mean for a run, above the parts (it imports their tables and their code):

- `checks.py`: `validate(config)`, the checks that need no model or data (`DistillConfig.validate()` reaches it
  through the registry: `distill.registry.config_rules`, registered by `distill.parts`);
- `reads.py`: no silent fields: every field set is read by some active part of the run;
- `help.py`: a field's help, generated from the registered parts (`distill train --help`, the docs' reference).

`distill.config` stays a leaf: it declares the fields and composes the parts' settings, and imports none of this.
"""
