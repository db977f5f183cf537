"""Op providers: the implementations step 3 puts under test."""
