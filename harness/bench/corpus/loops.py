"""placeholder"""
CASES: tuple = ()
