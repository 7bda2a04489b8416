"""DP generative models and the schema encoder/decoder they sample through.

Nothing in this package imports Prefect or MLflow: a registered generator samples with only this
package, torch and pandas.
"""
