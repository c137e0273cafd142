"""Every optimizer, and the optimizer step: the algorithms' own optimizers made by name (`make`), the step every
update takes with its gradient hook and clip (`step`), and the optimizers that lock-free actor-learners share
(`shared`: Shared RMSProp, momentum SGD, Shared Adam, and a copy of an algorithm's own optimizer)."""
