"""The reference's roles beside the model (train_fox.py): fixtures.py writes the fixtures fox.c is
checked against, mc.py the multiple-choice reference, hf.py the exchange with the official FoX code."""
