VALUE = "relative import"
