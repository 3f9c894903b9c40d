"""Training: the scripts' shared loop (:mod:`.common`), data sets
(:mod:`.data`) and models (:mod:`.models`)."""
