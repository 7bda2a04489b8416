"""The table's public description and the code that reads it: schema, encoding, preprocessing (split and
imputation), the cells that count rows, and the demo tables generated from a schema alone."""
