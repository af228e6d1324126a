"""`dist.variable_all_to_all`: rows sent by counts to every rank."""
